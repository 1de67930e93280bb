"""Column names: every name the tool reads or writes, in one place (log-schema.md)."""

# required input columns
GROUP_ID = "group_id"
TRAJ_ID = "traj_id"
STEP_IDX = "step_idx"
REWARD = "reward"

# columns some commands need
PROMPT = "prompt"
MESSAGES = "messages"
ACTION = "action"
ANCHOR_OBS = "anchor_obs"
ANCHOR_KEY = "anchor_key"

# optional input columns
DONE = "done"
EPISODE_REWARD = "episode_reward"
PROMPT_TOKEN_IDS = "prompt_token_ids"
ACTION_TOKEN_IDS = "action_token_ids"
BEHAVIOR_LOGPROBS = "behavior_logprobs"
SUCCESS = "success"

# written by `gaca score`
NLL_SUM = "nll_sum"
NLL_MEAN = "nll_mean"
N_ACTION_TOKENS = "n_action_tokens"
TOKEN_LOGPROBS = "token_logprobs"

# written by `gaca advantages`
RETURN_TO_GO = "return_to_go"
ADV_EPISODE = "adv_episode"
ADV_STEP = "adv_step"
STEP_GROUP_ID = "step_group_id"
STEP_GROUP_SIZE = "step_group_size"
NLL_Z = "nll_z"
GACA_WEIGHT = "gaca_weight"
HISTORY_GROUPS = "history_groups"
ADVANTAGE = "advantage"
ADV_METHOD = "adv_method"

REQUIRED = (GROUP_ID, TRAJ_ID, STEP_IDX, REWARD)
SCORE_OUTPUTS = (NLL_SUM, NLL_MEAN, N_ACTION_TOKENS, TOKEN_LOGPROBS)
ADVANTAGES_OUTPUTS = (
    RETURN_TO_GO,
    ADV_EPISODE,
    ADV_STEP,
    STEP_GROUP_ID,
    STEP_GROUP_SIZE,
    NLL_Z,
    GACA_WEIGHT,
    HISTORY_GROUPS,
    ADVANTAGE,
    ADV_METHOD,
)

# Parquet key/value metadata keys (values are JSON documents)
META_SCORE = "gaca.score"
META_ADVANTAGES = "gaca.advantages"
META_TRAIN = "gaca.train"
