"""The sidecar's protocol, generated from ``proto/leasehold/v1/leasehold.proto`` (checked in;
``python/generate.py`` regenerates it, and the package's tests check that it matches)."""
