"""Readers for external profilers' output (Nsight Systems), set beside the plugin's records."""
