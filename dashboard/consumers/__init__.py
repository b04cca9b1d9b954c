"""Consumers: the parties a team's events are addressed to (its customers), and their endpoints."""
