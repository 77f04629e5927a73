"""The runtime kit every CRM process shares: settings, logs, traces, metrics, gRPC, DB, NATS."""

import os

# gRPC core reads GRPC_EXPERIMENTS once, when grpc is first imported; every service imports crmkit
# before anything that imports grpc, so the default is set here. grpcio's EventEngine TCP client
# and listener cost ~0.07 ms more CPU per call on each end than the endpoints they replace
# (docs/decisions.md, "gRPC transport"). An operator's own GRPC_EXPERIMENTS wins.
GRPC_EXPERIMENTS_DEFAULT = "-event_engine_client,-event_engine_listener"
os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS_DEFAULT)
