"""Draft & Verify's adaptive gamma (HEADS.md section 6) against a hand computation, and the
layer-skip config's refusals."""

import pytest

from draftwise.errors import InputError
from draftwise.options import parse_config
from draftwise.proposers.layer_skip import GammaController, GammaRule, LayerSkipConfig


def test_the_ema_rule_step_by_step():
    rule = GammaRule(beta1=0.5, beta2=0.9, eps=0.01, target=0.9)
    controller = GammaController(0.6, rule)
    # round 1: acceptance 0.2 -> ema = 0.5 * 0.9 + 0.5 * 0.2 = 0.55 <= 0.9: cand = 0.61
    # gamma = 0.9 * 0.6 + 0.1 * 0.61 = 0.601
    assert controller.update(0.2) == pytest.approx(0.601, abs=1e-12)
    assert controller.ema == pytest.approx(0.55, abs=1e-12)
    # round 2: acceptance 1.0 -> ema = 0.5 * 0.55 + 0.5 = 0.775 <= 0.9: cand = 0.611
    # gamma = 0.9 * 0.601 + 0.1 * 0.611 = 0.602
    assert controller.update(1.0) == pytest.approx(0.602, abs=1e-12)
    # round 3 and 4: acceptance 1.0 -> ema = 0.8875, then 0.94375 > 0.9: cand = gamma - eps
    controller.update(1.0)
    assert controller.ema == pytest.approx(0.8875)
    before = controller.gamma
    assert controller.update(1.0) == pytest.approx(0.9 * before + 0.1 * (before - 0.01), abs=1e-12)
    assert controller.gamma < before  # confident rounds lower gamma: draft deeper


def test_gamma_stays_a_usable_threshold_and_reset_restores_the_start():
    controller = GammaController(0.99, GammaRule(0.0, 0.0, 0.5, 1.0))  # cand jumps by 0.5 each round
    for _ in range(5):
        assert 0.0 <= controller.update(0.0) < 1.0
    controller.reset()
    assert controller.gamma == 0.99 and controller.ema == 1.0


def test_the_config_defaults_are_the_rules_and_bad_values_are_refused():
    config = LayerSkipConfig()
    assert config.rule == GammaRule(config.beta1, config.beta2, config.eps, config.target_acceptance)
    parsed = parse_config(LayerSkipConfig, {"gamma": "0.3", "adaptive": "false", "target_acceptance": "0.7"}, "t")
    assert (parsed.gamma, parsed.adaptive, parsed.rule.target) == (0.3, False, 0.7)
    for values, message in (({"beta1": "1.5"}, "beta1"), ({"eps": "0"}, "eps"), ({"gamma": "1"}, "gamma"),
                            ({"k": "0"}, "draft length"), ({"tree": "auto"}, "index paths")):
        with pytest.raises(InputError, match=message):
            parse_config(LayerSkipConfig, values, "proposer layer-skip")
