"""The Riverbed cluster: nodes joined through etcd, streams replicated chunk by chunk (issue 23).

Nothing here is imported unless `riverbed serve --etcd` or `riverbed cluster` asks for it."""
