"""The agent harness (one episode: teacher turns <-> sandbox commands) and the asyncio driver that
keeps many episodes in flight inside one shard."""

from .harness import FENCE, HARNESS, SYSTEM_PROMPT, TOOLS, EpisodeSettings, rollout_id, run_episode

__all__ = ["FENCE", "HARNESS", "SYSTEM_PROMPT", "TOOLS", "EpisodeSettings", "rollout_id", "run_episode"]
