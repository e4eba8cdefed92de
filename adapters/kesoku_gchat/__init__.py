"""The Google Chat adapter: Pub/Sub pull and Chat REST (a skeleton until the Google Chat issue lands)."""
