//! How a policy's loss over an action chunk counts the actions that ran past their episode's
//! end (`action_is_pad`), which LeRobot's releases count differently.

use tch::{Kind, Tensor};

/// How the actions of a chunk that ran past its episode's end enter the mean of a loss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PaddedActions {
    /// Left out: the mean is over the actions inside the episode (LeRobot 0.6.1).
    #[default]
    Exclude,
    /// Counted as actions without error: the mean is over every action of every chunk
    /// (LeRobot 0.4.4), so chunks near an episode's end weigh less.
    Zero,
}

impl PaddedActions {
    /// The name `lake train --padded-actions` takes.
    pub fn name(self) -> &'static str {
        match self {
            PaddedActions::Exclude => "exclude",
            PaddedActions::Zero => "zero",
        }
    }
}

impl std::str::FromStr for PaddedActions {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exclude" => Ok(PaddedActions::Exclude),
            "zero" => Ok(PaddedActions::Zero),
            _ => Err(format!("{s:?} is not a way to count padded actions: exclude (LeRobot 0.6.1) or zero (LeRobot 0.4.4)")),
        }
    }
}

/// The mean of `errors` (`[B, T, A]`, one per action element) with the actions that `pad`
/// (bool `[B, T]`, true where padded) marks counted as `padded` says; every element without
/// `pad`. The operations are LeRobot's, so the value is its to the bit.
pub fn padded_mean(errors: &Tensor, pad: Option<&Tensor>, padded: PaddedActions) -> Tensor {
    let Some(pad) = pad else { return errors.mean(None::<Kind>) };
    let valid = pad.logical_not().unsqueeze(-1);
    let kept = errors * &valid;
    match padded {
        PaddedActions::Zero => kept.mean(None::<Kind>),
        PaddedActions::Exclude => {
            let count = valid.sum(Kind::Int64) * *errors.size().last().expect("[B, T, A] errors");
            kept.sum(None::<Kind>) / count.clamp_min(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::{PaddedActions, padded_mean};

    #[test]
    fn padded_actions_are_left_out_or_counted_as_zero() {
        // Two chunks of three actions of two values; the second chunk's last two are padded.
        let errors = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.]).view([2, 3, 2]);
        let pad = Tensor::from_slice(&[false, false, false, false, true, true]).view([2, 3]);
        let mean = |padded| padded_mean(&errors, Some(&pad), padded).double_value(&[]);
        // Kept: 1..=6 and 7, 8 — sum 36 over 8 values, or over all 12.
        assert_eq!(mean(PaddedActions::Exclude), 36.0 / 8.0);
        assert_eq!(mean(PaddedActions::Zero), 36.0 / 12.0);
        assert_eq!(padded_mean(&errors, None, PaddedActions::Exclude).double_value(&[]), 78.0 / 12.0);
        // Every action padded: nothing to average, and no division by zero.
        let all = Tensor::ones([2, 3], (Kind::Bool, tch::Device::Cpu));
        assert_eq!(padded_mean(&errors, Some(&all), PaddedActions::Exclude).double_value(&[]), 0.0);
        assert_eq!(padded_mean(&errors, Some(&all), PaddedActions::Exclude).kind(), Kind::Float);
    }

    #[test]
    fn the_names_are_the_flags_values() {
        for padded in [PaddedActions::Exclude, PaddedActions::Zero] {
            assert_eq!(padded.name().parse::<PaddedActions>(), Ok(padded));
            assert_eq!(serde_json::to_string(&padded).unwrap(), format!("\"{}\"", padded.name()));
        }
        assert!("ignore".parse::<PaddedActions>().unwrap_err().contains("exclude (LeRobot 0.6.1) or zero (LeRobot 0.4.4)"));
    }
}
