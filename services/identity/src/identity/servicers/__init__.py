"""gRPC servicers of the identity service, one module per service of the proto."""
