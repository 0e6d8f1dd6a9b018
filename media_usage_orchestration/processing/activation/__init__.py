"""Capture activation: `expanded → activating → active`."""
