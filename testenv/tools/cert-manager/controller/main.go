// Command controller runs cert-manager's controllers for node-holder's tests:
// the Issuer controller with the SelfSigned and CA issuers, the Certificate
// controllers and the CertificateRequest approver and signers of those two
// issuer types — what the chart's cert-manager mode needs, nothing else.
//
// cert-manager's own main (github.com/cert-manager/cert-manager/cmd/controller)
// is a separate Go module that the module proxy does not serve, so this wires
// up the controllers of the root module, which it does serve, the way that
// main does: one ContextFactory, each registered controller constructed from
// it, the shared informers started, every controller run until the process
// is told to stop. No leader election: the tests run one copy.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Each of these registers its controller (init) with controllerpkg.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	// ...and these their issuer type (init) with the Issuer controller.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server to run against")
	clusterResourceNamespace := flag.String("cluster-resource-namespace", "cert-manager",
		"namespace of the Secrets that ClusterIssuers refer to")
	namespace := flag.String("namespace", "", "the only namespace to watch (empty: all)")
	workers := flag.Int("workers", 2, "workers per controller")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "controller: --kubeconfig is required")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, klog.Background(), "controller")
	if err := run(ctx, controllerpkg.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		Namespace:          *namespace,
		IssuerOptions: controllerpkg.IssuerOptions{
			ClusterResourceNamespace: *clusterResourceNamespace,
		},
		// cert-manager's defaults: a failed request is retried after 1h,
		// backing off to 32h.
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	}, *workers); err != nil {
		klog.ErrorS(err, "controller failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, opts controllerpkg.ContextOptions, workers int) error {
	factory, err := controllerpkg.NewContextFactory(ctx, opts)
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}
	// The informers a controller needs are registered while it is
	// constructed, so every controller is built before any informer starts.
	known := controllerpkg.Known()
	names := make([]string, 0, len(known))
	for name := range known {
		names = append(names, name)
	}
	sort.Strings(names)
	controllers := make(map[string]controllerpkg.Interface, len(names))
	for _, name := range names {
		controller, err := known[name](factory)
		if err != nil {
			return fmt.Errorf("constructing controller %s: %w", name, err)
		}
		controllers[name] = controller
	}
	// Every Context the factory builds shares these informer factories.
	shared, err := factory.Build()
	if err != nil {
		return fmt.Errorf("building the shared context: %w", err)
	}

	errs := make(chan error, len(controllers))
	var wg sync.WaitGroup
	for name, controller := range controllers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			klog.InfoS("starting controller", "controller", name)
			if err := controller.Run(workers, ctx); err != nil {
				errs <- fmt.Errorf("controller %s: %w", name, err)
			}
		}()
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	klog.InfoS("controllers started", "controllers", names)

	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	wg.Wait()
	return nil
}
