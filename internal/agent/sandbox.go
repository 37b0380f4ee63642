package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/allotlabs/allot/internal/agentproto"
)

// identity is the POSIX account a job runs as.
type identity struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
	// Same is set when the job runs as the agent's own user (an agent
	// started with RunAsAgent: development only).
	Same bool
}

// jobIdentity resolves the account of lease l on this node: the lease's
// User (the server's choice: the submitter's mapping, OIDC claim or team
// service account), else the agent's JobUser. A job never runs as root, as
// the root group, or as the agent's own account.
func (a *Agent) jobIdentity(l agentproto.Lease) (identity, error) {
	if a.cfg.RunAsAgent {
		u, err := user.Current()
		if err != nil {
			return identity{}, err
		}
		return identity{Name: u.Username, UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Home: u.HomeDir, Same: true}, nil
	}
	name := l.User
	if name == "" {
		name = a.cfg.JobUser
	}
	if name == "" {
		return identity{}, errors.New("the job has no POSIX account to run as: the server sent none (map the user or set the team's service account) and this agent has no --job-user")
	}
	u, err := user.Lookup(name)
	if err != nil {
		return identity{}, fmt.Errorf("POSIX account %q does not exist on node %s", name, a.cfg.Hostname)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return identity{}, fmt.Errorf("POSIX account %q has a non-numeric uid/gid", name)
	}
	switch {
	case uid == 0:
		return identity{}, fmt.Errorf("refusing to run a job as %q: it is root (uid 0)", name)
	case gid == 0:
		return identity{}, fmt.Errorf("refusing to run a job as %q: its primary group is root (gid 0)", name)
	case int(uid) == os.Geteuid():
		return identity{}, fmt.Errorf("refusing to run a job as %q: it is the agent's own account", name)
	}
	id := identity{Name: name, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			n, err := strconv.ParseUint(g, 10, 32)
			if err == nil && n != 0 && !slices.Contains(id.Groups, uint32(n)) {
				id.Groups = append(id.Groups, uint32(n))
			}
		}
	}
	if len(id.Groups) == 0 {
		id.Groups = []uint32{id.GID}
	}
	return id, nil
}

// ownedDir makes dir (its parents root-owned, 0755) a directory of the
// job's user with mode 0700: a job's checkpoints and scratch space are
// unreadable to other users. A symlink or non-directory at dir is refused.
func ownedDir(dir string, id identity) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if id.Same {
		return nil
	}
	if err := os.Lchown(dir, int(id.UID), int(id.GID)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// NVIDIA character devices: major 195 holds the GPUs (minor = the GPU's
// minor number), nvidiactl (255) and nvidia-modeset (254); nvidia-uvm has
// a dynamic major (see /proc/devices).
const (
	nvidiaMajor      = 195
	nvidiaCtlMinor   = 255
	nvidiaModeset    = 254
	fakeDevicePrefix = "nvidia"
)

// jobDevices are the devices job l may open: its GPUs and the driver's
// control devices; every other GPU is denied.
func (a *Agent) jobDevices(l agentproto.Lease) []devNum {
	devs := []devNum{{nvidiaMajor, nvidiaCtlMinor}, {nvidiaMajor, nvidiaModeset}}
	if m, ok := charMajor("nvidia-uvm"); ok {
		devs = append(devs, devNum{m, -1})
	}
	for _, g := range l.GPUs {
		devs = append(devs, devNum{nvidiaMajor, int64(a.gpuMinor(g))})
	}
	return devs
}

func (a *Agent) gpuMinor(index int) int {
	if m, ok := a.inv.Minors[index]; ok {
		return m
	}
	return index
}

// gpuDevicePaths are the device files of the job's GPUs.
func (a *Agent) gpuDevicePaths(gpus []int) []string {
	var out []string
	for _, g := range gpus {
		out = append(out, filepath.Join(a.devDir(), fakeDevicePrefix+strconv.Itoa(a.gpuMinor(g))))
	}
	return out
}

func (a *Agent) devDir() string {
	if a.inv.DevDir != "" {
		return a.inv.DevDir
	}
	return "/dev"
}

// charMajor reads a character device's major number from /proc/devices.
func charMajor(name string) (int64, bool) {
	f, err := os.Open("/proc/devices")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	block := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "Block devices") {
			block = true
		}
		fs := strings.Fields(line)
		if !block && len(fs) == 2 && fs[1] == name {
			n, err := strconv.ParseInt(fs[0], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// makeFakeDevices creates character device nodes for the fake backend's
// GPUs (major 195, minor = index) and nvidiactl in dir, so the device
// fence is tested for real: opening a GPU the job was not given fails with
// EPERM (the cgroup), opening its own fails with ENXIO (no driver).
func makeFakeDevices(dir string, gpus int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mk := func(name string, minor int) error {
		p := filepath.Join(dir, name)
		if fi, err := os.Lstat(p); err == nil {
			if fi.Mode()&os.ModeCharDevice != 0 {
				return nil
			}
			_ = os.Remove(p)
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(nvidiaMajor, uint32(minor)))); err != nil {
			return fmt.Errorf("creating fake GPU device %s: %w", p, err)
		}
		return os.Chmod(p, 0o666)
	}
	for i := range gpus {
		if err := mk(fakeDevicePrefix+strconv.Itoa(i), i); err != nil {
			return err
		}
	}
	return mk("nvidiactl", nvidiaCtlMinor)
}
