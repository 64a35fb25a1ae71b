"""Serving: an OpenAI-compatible HTTP API on the engine, its metrics, and the live page."""
