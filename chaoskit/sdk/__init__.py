"""What training code imports. See :mod:`chaoskit.sdk.probe`."""
