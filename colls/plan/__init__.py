"""`colls plan`: predicted collective and training-step times from the `sim` transport."""
