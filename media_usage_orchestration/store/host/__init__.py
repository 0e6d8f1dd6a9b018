"""EmDash's host rows the workflows read and guard on: the collection registry, content entries and
their fields, each collection's index status row, the global activation row."""
