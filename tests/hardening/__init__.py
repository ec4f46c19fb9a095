"""Hardening tests: the queue against storage that fails the way real networks do."""
