"""Pure values both `media/` and `store/` use, with no SQL and no I/O: identifier rules, opaque
cursors, outcomes, JSON text as EmDash reads it, source records and the one error module."""
