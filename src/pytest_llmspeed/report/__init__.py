"""Reporting: cell records, JSON results written cell by cell, the terminal matrix."""
