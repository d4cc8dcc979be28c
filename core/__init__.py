"""Building blocks shared by every app, importing none of them: errors, API and admin bases, broker, tracing,
logging, health and metrics registries, backoff, and the message contract between the two services."""
