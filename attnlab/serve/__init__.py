"""Serving: an OpenAI-compatible HTTP API on the one-step scheduler, its metrics, and the live page."""
