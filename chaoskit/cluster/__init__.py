"""The nodes a run may touch and how to reach them: the inventory (:mod:`.inventory`, :mod:`.inventory_spec`,
:mod:`.inventory_file`), selectors (:mod:`.selectors`), transports (:mod:`.transports`)
and commands run on the controller for a node (:mod:`.power`). See ``docs/architecture.md``.
"""
