"""Offline batch jobs: resumable JSONL generation and embedding jobs, on one machine or on Ray."""
from .jobs import JobError, run_job
from .tasks import EmbedTask, GenerateTask

__all__ = ["run_job", "JobError", "GenerateTask", "EmbedTask"]
