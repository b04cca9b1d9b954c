"""The delivery engine: claim due deliveries, sign, POST, record the attempt, decide what is next."""
