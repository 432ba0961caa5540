"""Communicators between devices and processes."""
