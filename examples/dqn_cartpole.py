"""DQN on gymnasium's CartPole-v1, the original torchtrace's use case: Q-learning with torchtrace's gradients.

The agent learns Q(s, a), the expected discounted return of pushing the cart left or right in state s.
Each update samples a batch of transitions (s, a, r, s', terminated) from a replay buffer and moves
Q(s, a) towards the one-step target computed with a slowly refreshed copy of the network (the target net):

    y = r + gamma * (1 - terminated) * max_a' Q_target(s', a')        loss = Huber(Q(s, a) - y)

Q(s, a) for the action actually taken is picked out of the network's (batch, 2) output with the original
torchtrace's `Gather`: `q.Gather(action)` is q[i, action[i]], so the gradient reaches only that entry.
The optimizer is RMSprop, as in the original DQN paper. The first update prints its backprop trace.

Solved means: the greedy policy averages a return >= 195 over 100 evaluation episodes (CartPole-v0's
criterion; v1 episodes are cut at 500). Training stops once greedy evaluations look good, or after
--max-steps environment steps; the best evaluated network is the one scored over 100 episodes.

    python examples/dqn_cartpole.py                      # seed 0, at most 40,000 steps
    python examples/dqn_cartpole.py --seeds 0 1 2 3 4    # several seeds, then their mean and spread
    python examples/dqn_cartpole.py --smoke              # 400 steps, a 5-episode evaluation (what CI runs)

Every random draw is seeded (torch's generator, the environment, exploration and replay sampling), so a run
is repeatable on one machine. But DQN amplifies the last bit of a float: a different CPU, thread count or
torch / gymnasium / numpy build can round one sum differently and end in another policy, and one seed's
result spreads widely (compare seeds with --seeds). The first line printed names everything that matters.
"""
import argparse
import copy
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace import nn


def q_network(n_observations: int, n_actions: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(n_observations, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, n_actions),
    )


class ReplayBuffer:
    """A ring buffer of transitions; `sample` draws a uniform random batch."""

    def __init__(self, capacity: int, n_observations: int, seed: int):
        self.states = np.zeros((capacity, n_observations), dtype=np.float32)
        self.next_states = np.zeros((capacity, n_observations), dtype=np.float32)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.capacity, self.size, self.position = capacity, 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, state: Any, action: int, reward: float, next_state: Any, terminated: bool) -> None:
        i = self.position
        self.states[i], self.actions[i], self.rewards[i] = state, action, reward
        self.next_states[i], self.terminated[i] = next_state, terminated
        self.position, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def sample(self, batch_size: int) -> List[torch.Tensor]:
        index = self.rng.integers(0, self.size, batch_size)
        return [torch.from_numpy(a[index]) for a in
                (self.states, self.actions, self.rewards, self.next_states, self.terminated)]


def greedy_action(q_net: torch.nn.Module, state: Any) -> int:
    with torch.no_grad():
        return int(q_net(torch.as_tensor(state).unsqueeze(0)).argmax(dim=1).item())


def evaluate(q_net: torch.nn.Module, episodes: int, seed: int) -> List[float]:
    """Returns of the greedy policy (no exploration) over `episodes` fresh episodes."""
    env = gym.make("CartPole-v1")
    returns = []
    for episode in range(episodes):
        state, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            state, reward, terminated, truncated, _ = env.step(greedy_action(q_net, state))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def update(q_net: torch.nn.Module, target_net: torch.nn.Module, optimizer: Any, batch: List[torch.Tensor],
           gamma: float, show: bool = False) -> float:
    """One DQN step on a batch; returns the loss."""
    states, actions, rewards, next_states, terminated = batch
    with torch.no_grad():  # the target is a constant: no graph is recorded for it
        next_q = target_net(next_states).max(dim=1).values
        target = (rewards + gamma * (1 - terminated) * next_q).unsqueeze(1)
    q = q_net(states).Gather(actions)  # Q(s, a) of the actions taken, shape (batch, 1)
    loss = F.smooth_l1_loss(q, target)
    optimizer.zero_grad()
    loss.backward(show=show)
    optimizer.step()
    return loss.item()


def train(args: argparse.Namespace) -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """Epsilon-greedy interaction, replay, one update per step; returns the best evaluated network and a log."""
    torch.manual_seed(args.seed)
    env = gym.make("CartPole-v1")
    env.action_space.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    n_observations, n_actions = env.observation_space.shape[0], int(env.action_space.n)
    q_net = q_network(n_observations, n_actions, args.hidden)
    target_net = copy.deepcopy(q_net)  # tracers deep-copy (graph fields dropped)
    optimizer = tt.optim.RMSprop(q_net.parameters(), lr=args.lr)
    buffer = ReplayBuffer(args.buffer, n_observations, args.seed)
    print(q_net)

    state, _ = env.reset(seed=args.seed)
    episode_return, returns, losses, evaluations = 0.0, [], [], []
    best_score, best_net = -1.0, copy.deepcopy(q_net)
    start = time.perf_counter()
    for step in range(1, args.max_steps + 1):
        epsilon = max(args.final_epsilon, 1 - (1 - args.final_epsilon) * step / args.epsilon_steps)
        action = int(rng.integers(n_actions)) if rng.random() < epsilon else greedy_action(q_net, state)
        next_state, reward, terminated, truncated, _ = env.step(action)
        buffer.add(state, action, float(reward), next_state, terminated)
        state, episode_return = next_state, episode_return + float(reward)
        if terminated or truncated:
            returns.append(episode_return)
            state, episode_return = env.reset()[0], 0.0

        if step >= args.learning_starts:
            batch = buffer.sample(args.batch_size)
            losses.append(update(q_net, target_net, optimizer, batch, args.gamma, show=not losses))
        if step % args.target_every == 0:
            target_net.load_state_dict(q_net.state_dict())
        if step % args.eval_every == 0:
            score = float(np.mean(evaluate(q_net, args.eval_episodes, seed=10_000 + step)))
            evaluations.append((step, score))
            recent = np.mean(returns[-20:]) if returns else 0.0
            print(f"step {step:6d}  episodes {len(returns):4d}  mean return (last 20) {recent:6.1f}  "
                  f"epsilon {epsilon:.2f}  greedy evaluation {score:6.1f}  ({time.perf_counter() - start:.0f} s)")
            if score >= best_score:  # DQN's greedy policy fluctuates during training: keep the best one seen
                best_score, best_net = score, copy.deepcopy(q_net)
            if score >= args.stop_at:
                break
    env.close()
    log = {"train_returns": returns, "losses": losses, "evaluations": evaluations, "steps": step,
           "seconds": time.perf_counter() - start}
    return best_net, log


def setup_line(args: argparse.Namespace) -> str:
    """What a run's numbers depend on besides the code: versions, threads, seed."""
    return (f"torch {torch.__version__}, gymnasium {gym.__version__}, numpy {np.__version__}, "
            f"{torch.get_num_threads()} thread(s), seed {args.seed}")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Train with args.seed and score the best network over args.final_episodes greedy episodes."""
    print(setup_line(args))
    agent, log = train(args)
    final = evaluate(agent, args.final_episodes, seed=1_000_000)
    average = float(np.mean(final))
    print(f"greedy policy over {args.final_episodes} evaluation episodes: average return {average:.1f} "
          f"({'solved' if average >= 195 else 'not solved'}: >= 195); trained {log['steps']} steps, "
          f"{len(log['train_returns'])} episodes, {log['seconds']:.0f} s")
    return {"average_return": average, "eval_returns": final, **log}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=40_000, help="environment steps, at most")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--buffer", type=int, default=50_000)
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--target-every", type=int, default=500, help="steps between target-network refreshes")
    parser.add_argument("--epsilon-steps", type=int, default=10_000, help="steps over which epsilon decays")
    parser.add_argument("--final-epsilon", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=2_000, help="steps between greedy evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--stop-at", type=float, default=475.0, help="stop when an evaluation averages this")
    parser.add_argument("--final-episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", help="run these seeds one after the other, then summarise")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (small networks run fastest on one)")
    parser.add_argument("--smoke", action="store_true", help="400 steps and short evaluations (for CI)")
    args = parser.parse_args(argv)
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(max_steps=400, learning_starts=100, eval_every=200, eval_episodes=2, final_episodes=5,
                            epsilon_steps=300)
        args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.seeds:
        return run(args)
    results = [run(argparse.Namespace(**{**vars(args), "seed": seed})) for seed in args.seeds]
    averages = [r["average_return"] for r in results]
    print(f"over seeds {args.seeds}: average returns {[round(a, 1) for a in averages]}; mean {np.mean(averages):.1f}, "
          f"min {min(averages):.1f}, max {max(averages):.1f}; solved (>= 195) for {sum(a >= 195 for a in averages)} "
          f"of {len(averages)}")
    return {"seeds": args.seeds, "average_returns": averages, "runs": results}


if __name__ == "__main__":
    main()
