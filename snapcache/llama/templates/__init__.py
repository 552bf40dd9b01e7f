"""What chats share: the prefix rendered chats with the same head share, and the chat templates
snapcache supplies."""
