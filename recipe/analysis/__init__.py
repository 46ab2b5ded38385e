"""Offline analysis of OPSD: frozen token-level signals, run logs and figures."""
