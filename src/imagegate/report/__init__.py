"""How results are written: console table, JSON (the statement), and more formats."""
