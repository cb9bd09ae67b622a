"""Trace formats: the raw recording, the .hct file, and their readers and writers."""
