"""OpenAI-compatible HTTP server (`spekula serve`)."""
