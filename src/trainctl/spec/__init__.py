"""The job specification: what a user asked for, validated before anything runs.

A leaf: it imports nothing of trainctl's but errors and settings-level helpers.
"""
