"""The index checked against its content: verify (the oracle) and the scrubber (the same comparison
a bounded slice at a time, differences confirmed on a second read and healed through the
operator's work retry)."""
