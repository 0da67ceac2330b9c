"""A ResNet-style CNN trained the way a torch user writes it, at module level: the loop
variable ``step`` and the epoch counter are globals, the losses are appended to a global
list, the model is switched to eval for a validation pass each epoch.

Run by tests/compiler/test_training_programs.py with ``COMPILE`` (compile the step or not);
``torch`` is fusegrad unless the runner gives another module."""

torch = globals().get("torch")
if torch is None:
    import fusegrad as torch
nn = torch.nn
F = torch.nn.functional

COMPILE = globals().get("COMPILE", False)
EPOCHS, STEPS_PER_EPOCH, BATCH = 2, 3, 4


class BasicBlock(nn.Module):
    def __init__(self, channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels * stride, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels * stride)
        self.conv2 = nn.Conv2d(channels * stride, channels * stride, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels * stride)
        self.shortcut = nn.Sequential()
        if stride != 1:
            self.shortcut = nn.Sequential(nn.Conv2d(channels, channels * stride, 1, stride,
                                                    bias=False),
                                          nn.BatchNorm2d(channels * stride))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4),
                                  nn.ReLU())
        self.layer1 = BasicBlock(4)
        self.layer2 = BasicBlock(4, stride=2)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        out = self.layer2(self.layer1(self.stem(x)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


torch.manual_seed(0)
model = ResNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
criterion = nn.CrossEntropyLoss()
images = torch.randn(STEPS_PER_EPOCH, BATCH, 3, 8, 8)
labels = torch.randint(0, 5, (STEPS_PER_EPOCH, BATCH))
val_images = torch.randn(BATCH, 3, 8, 8)

losses = []
val_losses = []
global_step = 0
epochs_done = 0


def train_step(x, y):
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


step_fn = torch.compile(train_step) if COMPILE else train_step

for epoch in range(EPOCHS):
    model.train()
    for step in range(STEPS_PER_EPOCH):
        loss = step_fn(images[step], labels[step])
        losses.append(loss.item())
        global_step += 1
    scheduler.step()
    model.eval()
    with torch.no_grad():
        val_losses.append(model(val_images).pow(2).mean().item())
    epochs_done = epoch + 1
