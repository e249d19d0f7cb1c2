"""The lowest layer: what every other part of chaoskit may use and nothing here imports from above.

Errors and exit codes (:mod:`.errors`), where state lives between commands
(:mod:`.state`), the base of every input model and the name patterns
(:mod:`.models`), durations (:mod:`.durations`), values that may reach a shell
(:mod:`.shell`), and YAML read with every value's position (:mod:`.yaml_source`).
See ``docs/architecture.md``.
"""
