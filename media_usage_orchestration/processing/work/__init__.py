"""The work processor: EmDash's tick, the inline path and the batch drain; one entry's projection
refresh and its bulk form; the content reads they start from."""
