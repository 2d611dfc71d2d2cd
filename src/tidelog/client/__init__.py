"""The tidelog client: asyncio producer, consumer and admin over the wire protocol, with a sync facade."""
