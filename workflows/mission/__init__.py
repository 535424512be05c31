"""Missions: the spec Mission Control starts with, the pure aggregation core, and the workflows."""
