"""Wire-level fakes of the model APIs, served on loopback for the real SDKs to talk to."""
