# EKS Pod Identity: pods get short-lived AWS credentials from their service
# account; no static keys anywhere. Roles below trust pods.eks.amazonaws.com.
data "aws_iam_policy_document" "pod_identity_trust" {
  statement {
    actions = ["sts:AssumeRole", "sts:TagSession"]
    principals {
      type        = "Service"
      identifiers = ["pods.eks.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "s3_rw" {
  for_each = {
    flow_runner = [aws_s3_bucket.this["dvc"].arn, aws_s3_bucket.this["mlflow"].arn]
    mlflow      = [aws_s3_bucket.this["mlflow"].arn]
  }
  statement {
    sid       = "ListBuckets"
    actions   = ["s3:ListBucket", "s3:GetBucketLocation"]
    resources = each.value
  }
  statement {
    sid       = "ReadWriteObjects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
    resources = [for arn in each.value : "${arn}/*"]
  }
  statement {
    sid       = "UseDataKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.data.arn]
  }
}

resource "aws_iam_role" "pod" {
  for_each           = data.aws_iam_policy_document.s3_rw
  name               = "${var.cluster_name}-${replace(each.key, "_", "-")}"
  assume_role_policy = data.aws_iam_policy_document.pod_identity_trust.json
}

resource "aws_iam_role_policy" "pod_s3" {
  for_each = data.aws_iam_policy_document.s3_rw
  name     = "s3-artifacts"
  role     = aws_iam_role.pod[each.key].id
  policy   = each.value.json
}

resource "aws_eks_pod_identity_association" "s3" {
  for_each = {
    flow_runner = var.flow_runner_service_account
    mlflow      = var.mlflow_service_account
  }
  cluster_name    = module.eks.cluster_name
  namespace       = var.namespace
  service_account = each.value
  role_arn        = aws_iam_role.pod[each.key].arn
}

# Cluster Autoscaler: scales the node groups between their min and max sizes
# (GPU nodes from zero). Managed node group ASGs carry the discovery tags.
data "aws_iam_policy_document" "cluster_autoscaler" {
  statement {
    sid = "Discover"
    actions = [
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeAutoScalingInstances",
      "autoscaling:DescribeLaunchConfigurations",
      "autoscaling:DescribeScalingActivities",
      "autoscaling:DescribeTags",
      "ec2:DescribeImages",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeLaunchTemplateVersions",
      "ec2:GetInstanceTypesFromInstanceRequirements",
      "eks:DescribeNodegroup",
    ]
    # checkov:skip=CKV_AWS_356:Describe* calls accept no resource-level restriction.
    resources = ["*"]
  }
  statement {
    sid       = "ScaleOwnGroupsOnly"
    actions   = ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/k8s.io/cluster-autoscaler/${var.cluster_name}"
      values   = ["owned"]
    }
  }
}

resource "aws_iam_role" "cluster_autoscaler" {
  name               = "${var.cluster_name}-cluster-autoscaler"
  assume_role_policy = data.aws_iam_policy_document.pod_identity_trust.json
}

resource "aws_iam_role_policy" "cluster_autoscaler" {
  name   = "cluster-autoscaler"
  role   = aws_iam_role.cluster_autoscaler.id
  policy = data.aws_iam_policy_document.cluster_autoscaler.json
}

resource "aws_eks_pod_identity_association" "cluster_autoscaler" {
  cluster_name    = module.eks.cluster_name
  namespace       = "kube-system"
  service_account = "cluster-autoscaler"
  role_arn        = aws_iam_role.cluster_autoscaler.arn
}
