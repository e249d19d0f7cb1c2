"""Commands registered on the main app (see chaoskit.cli.app._register_commands)."""


def register(app) -> None:  # filled in by the module's owner
    return None
