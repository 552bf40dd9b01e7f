"""The chat dialects, a folder each: its protocol (request and answer models), its translations
(body to `ChatRequest`, engine events to its answer), its `Dialect` and its routes. They import the
request and the events, never the engine (`serving.ChatRunner` is what they ask of it); the
skeleton they share is `dialect`, `serving` and `streaming`."""
