"""EmDash's scheduled lane: the activation row's turn rotated, then that one workflow's tick."""
