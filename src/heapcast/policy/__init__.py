"""Policies: trained models compiled into artefacts that run outside Python (issue 9)."""
