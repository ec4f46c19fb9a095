"""Example applications, one per framework, that run unchanged on objq."""
