"""Whether this machine is logged in to W&B, asked the way `wandb.init` asks, without a prompt and without the network.

wandb has no public question for it: `wandb.login(verify=False, prompt=False)` answers, but asks the server for the
user's name to print it and saves the settings file. `wandb.sdk.lib.wbauth.authenticate_session` (wandb 0.31) is what
`wandb.init` and `wandb.login` call: it reads WANDB_API_KEY, an identity token file, the netrc entry `wandb login`
writes and the settings files, for the server WANDB_BASE_URL names. This file is the one place that calls it, and
wandb's private `_setup`, which sets wandb up without starting its service process (every DDP rank asks).
"""

import wandb
from wandb.errors import AuthenticationError
from wandb.sdk import wandb_setup
from wandb.sdk.lib import wbauth

from project.engine.errors import UserError


def logged_in(settings: wandb.Settings) -> bool:
    """Whether wandb finds credentials for its server here; a malformed key (WANDB_API_KEY=abc) is the user's
    error, not a reason to go offline. wandb is set up with `settings` first: the settings wandb reads once per process
    (`silent` for what it prints, the server's address) are then the run's from the start."""
    global_settings = wandb_setup._setup(settings, start_service=False).settings
    host = wbauth.HostUrl(global_settings.base_url, app_url=global_settings.app_url)
    try:
        found = wbauth.authenticate_session(host=host, source="logger=wandb", prompt=False, update_session=False)
    except AuthenticationError as error:
        reason = str(error).rstrip(".")
        raise UserError(f"logger=wandb: {reason}: run `wandb login --relogin`, or set WANDB_MODE=offline") from None
    return found is not None
