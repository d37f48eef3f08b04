"""Generated from runtime.proto by `make proto` (the crossrt.v1 service); do not edit."""
