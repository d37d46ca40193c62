"""The C sources of ncclrl's NCCL tuner plugin, shipped as package data (``ncclrl plugin build``)."""
