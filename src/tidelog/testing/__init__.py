"""Harnesses importable by tests: free ports, real server processes, fault injection, history checking."""
