"""Real protocol peers for the exporter tests: an OTLP receiver (HTTP and gRPC), a Prometheus server
launcher with promtool, and an NVTX injection library (C source, builder, capture reader)."""
