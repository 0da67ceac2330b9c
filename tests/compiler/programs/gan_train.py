"""A small GAN trained the way a torch user writes it, at module level: a discriminator
step and a generator step, each compiled on its own, the loop variable ``step`` and lists
of losses appended each step as globals.

Run by tests/compiler/test_training_programs.py with ``COMPILE`` (compile the steps or
not); ``torch`` is fusegrad unless the runner gives another module."""

torch = globals().get("torch")
if torch is None:
    import fusegrad as torch
nn = torch.nn

COMPILE = globals().get("COMPILE", False)
STEPS, BATCH, LATENT = 6, 8, 4

torch.manual_seed(0)
generator = nn.Sequential(nn.Linear(LATENT, 16), nn.ReLU(), nn.Linear(16, 2))
discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
opt_g = torch.optim.Adam(generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))
criterion = nn.BCEWithLogitsLoss()
real_data = torch.randn(STEPS, BATCH, 2) * 0.5 + 2.0
noise = torch.randn(STEPS, 2, BATCH, LATENT)
ones = torch.ones(BATCH, 1)
zeros = torch.zeros(BATCH, 1)

d_losses = []
g_losses = []


def d_step(real, z):
    opt_d.zero_grad()
    fake = generator(z).detach()
    loss = criterion(discriminator(real), ones) + criterion(discriminator(fake), zeros)
    loss.backward()
    opt_d.step()
    return loss


def g_step(z):
    opt_g.zero_grad()
    loss = criterion(discriminator(generator(z)), ones)
    loss.backward()
    opt_g.step()
    return loss


d_fn = torch.compile(d_step) if COMPILE else d_step
g_fn = torch.compile(g_step) if COMPILE else g_step

for step in range(STEPS):
    d_losses.append(d_fn(real_data[step], noise[step, 0]).item())
    g_losses.append(g_fn(noise[step, 1]).item())
