"""Deliver notifications: Standard Webhooks over httpx, email over SMTP, a shared circuit breaker."""
