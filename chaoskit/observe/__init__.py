"""The run's timeline: the event bus (:mod:`.events`) and the probes that publish into it
(:mod:`.probes`, :mod:`.ray_nodes`). See ``docs/architecture.md``.
"""
