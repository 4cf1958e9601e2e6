"""The training controller: an event-driven state machine in the driver process."""
