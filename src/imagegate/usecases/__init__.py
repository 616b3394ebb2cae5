"""The use cases: accept (run), complete, index, audit, fleet."""
