"""The edge gateway: authentication, rate limits, REST and GraphQL, translated into gRPC."""
