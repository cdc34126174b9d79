"""The data plane: the OpenAI-compatible API, balancing, the upstream proxy and SSE relay.

The router never imports the control plane. It receives endpoints through the
`EndpointSink` interface (`llmgw.router.endpoints`); router-only mode feeds it
static endpoints the same way.
"""
