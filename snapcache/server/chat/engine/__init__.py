"""The chat engine: where every dialect's `ChatRequest` runs on the model engine, its prompt rules
applied, its tools rendered and its calls read back (the model's own format or the generic one),
and its answer given back as the events of `snapcache.server.chat.events`."""
