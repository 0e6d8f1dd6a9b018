"""Collection deletion: the request, the front and back phases, EmDash's tick."""
